# cmake -DINPUT=FILE -DOUTPUT=FILE.c -DNAME=symbol -P embed.cmake: writes a C file that defines
# `const char NAME[]` (the bytes of INPUT, then a NUL) and `const size_t NAME_len`, so a file the
# daemon serves (the OpenAPI description) is part of the binary and cannot go missing or stale.
file(READ "${INPUT}" hex HEX)
string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
file(WRITE "${OUTPUT}.tmp"
  "/* generated from ${INPUT} by api/embed.cmake: do not edit */\n#include <stddef.h>\n"
  "const char ${NAME}[] = {${bytes}0};\nconst size_t ${NAME}_len = sizeof ${NAME} - 1;\n")
file(RENAME "${OUTPUT}.tmp" "${OUTPUT}")
