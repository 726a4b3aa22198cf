"""Keep one process running: start it again when it dies, as compose's restart policy or systemd's
``Restart=on-failure`` would, for the stack's Kafka Connect worker.

``python -m tidemark_workshop.stack.keeper <name> -- <command ...>`` runs the command as its child, in
the keeper's process group (the stack starts the keeper in a session of its own, so the group is the
unit a stop signals whole). When the child ends and no stop was asked, it is started again after a
backoff (1, 2, 4 ... 30 s); past ``BUDGET`` restarts within ``WINDOW`` the keeper gives up and says so,
rather than loop on a worker that cannot start. SIGTERM or SIGINT to the keeper (or its group) stops
the child and the keeper with it. Each restart is one line in the process's log, which names it.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time

BUDGET, WINDOW = 5, 600.0  # restarts, seconds
BACKOFF_MAX = 30.0


def keep(name: str, argv: list[str], *, budget: int = BUDGET, window: float = WINDOW) -> int:
    stopping = False
    child: subprocess.Popen | None = None

    def stop(signum, _frame):
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.send_signal(signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    restarts: list[float] = []
    while True:
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
        if stopping:  # asked to stop while it was being started
            child.terminate()
        code = child.wait()
        if stopping:
            return 0
        now = time.monotonic()
        restarts = [t for t in restarts if now - t < window]
        if len(restarts) >= budget:
            say(f"{name} ended (exit {code}) after {len(restarts)} restarts within {window:.0f} s: not started "
                f"again. Next: read the lines above for why, fix it, then `make start C={name}`")
            return code or 1
        delay = min(2.0 ** len(restarts), BACKOFF_MAX)
        say(f"{name} ended (exit {code}) without being asked to: starting it again in {delay:.0f} s "
            f"(restart {len(restarts) + 1} of {budget} within {window:.0f} s)")
        restarts.append(now)
        deadline = time.monotonic() + delay
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.2)
        if stopping:
            return 0


def say(message: str) -> None:
    print(f"[tidemark stack] keeper: {message}", flush=True)


def main(argv: list[str]) -> int:
    if len(argv) < 3 or argv[1] != "--":
        print("usage: python -m tidemark_workshop.stack.keeper <name> -- <command ...>", file=sys.stderr)
        return 2
    return keep(argv[0], argv[2:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
