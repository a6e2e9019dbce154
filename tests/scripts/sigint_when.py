"""Shared by the Ctrl-C checks of the command-line programs: read a child's stream until a condition on what was read
holds, then send it SIGINT (they wait for the program to have started its work, never for a clock)."""
import signal


def sigint_when(proc, stream, done, read):
    """Reads `stream` with `read(stream)` (a byte, a line) until done(seen) or its end, then SIGINTs `proc`; returns
    the bytes seen."""
    seen = b""
    while not done(seen):
        chunk = read(stream)
        if not chunk:
            break
        seen += chunk
    proc.send_signal(signal.SIGINT)
    return seen
