/* The one integer parser of options, environment variables and HTTP parameters: the whole text,
 * in range, no wrap-around; and the monotonic clock and its condition-variable deadlines. */
#include "base/td_clock.h"
#include "base/td_parse.h"

#include <criterion/criterion.h>
#include <limits.h>

Test(parse, whole_decimals_in_range) {
    long v = 0;
    cr_assert(td_parse_long("42", 0, 100, &v) && v == 42);
    cr_assert(td_parse_long("-7", -10, 10, &v) && v == -7);
    cr_assert(td_parse_long("+7", 0, 10, &v) && v == 7);
    cr_assert(td_parse_long("0", 0, 0, &v) && v == 0);
}

Test(parse, anything_else_is_refused_and_out_is_untouched) {
    const char *bad[] = {"", "-", "+", " 1", "1 ", "1x", "0x10", "1.0", "1e3", "--1", "abc"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        long v = 99;
        cr_assert(!td_parse_long(bad[i], LONG_MIN, LONG_MAX, &v), "\"%s\" was accepted", bad[i]);
        cr_assert_eq(v, 99);
    }
    long v = 99;
    cr_assert(!td_parse_long("101", 0, 100, &v), "above the range");
    cr_assert(!td_parse_long("-1", 0, 100, &v), "below the range");
}

Test(parse, the_ends_of_long_and_no_wrap_around) {
    long v;
    cr_assert(td_parse_long("9223372036854775807", LONG_MIN, LONG_MAX, &v) && v == LONG_MAX);
    cr_assert(td_parse_long("-9223372036854775808", LONG_MIN, LONG_MAX, &v) && v == LONG_MIN);
    cr_assert(!td_parse_long("9223372036854775808", LONG_MIN, LONG_MAX, &v));
    cr_assert(!td_parse_long("-9223372036854775809", LONG_MIN, LONG_MAX, &v));
    cr_assert(!td_parse_long("99999999999999999999999", LONG_MIN, LONG_MAX, &v));
}

Test(parse, a_prefix_of_given_length) {
    long v;
    cr_assert(td_parse_long_n("123/metrics", 3, 0, 1000, &v) && v == 123);
    cr_assert(!td_parse_long_n("12x", 3, 0, 1000, &v));
    cr_assert(!td_parse_long_n("12", 0, 0, 1000, &v), "no digits at all");
}

Test(clock, monotonic_and_deadlines_ahead) {
    double a = td_clock_now(), b = td_clock_now();
    cr_assert(b >= a);
    cr_assert(td_clock_wall() > 1.6e9, "the wall clock is in seconds since 1970");
    struct timespec ts;
    td_clock_deadline(&ts, 2.5);
    double at = (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
    cr_assert(at >= b + 2.5 && at < td_clock_now() + 2.5 + 1.0, "%f vs %f", at, b);
    cr_assert(ts.tv_nsec >= 0 && ts.tv_nsec < 1000000000L);
}
