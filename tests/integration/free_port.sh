# Sourced by the launcher tests (needs $py, a Python). free_port: a free port below the kernel's
# ephemeral range (32768 and up), where no outgoing connection of another program can take it
# between this probe and a launcher's bind (a CI run lost a c10d host election so: both
# launchers found the port in use).
free_port() {
    "$py" -c '
import random, socket
for _ in range(1000):
    s = socket.socket()
    try:
        s.bind(("0.0.0.0", random.randrange(20000, 32000)))
    except OSError:
        continue
    print(s.getsockname()[1])
    break'
}
