"""Run `accelbench ARGS` and, if the interpreter takes more than 2 s to end after its exit
handlers, print every thread's stack (what the process waits on after its last line)."""
import atexit
import faulthandler
import sys
import time

atexit.register(lambda: (print(f"exitwatch: exit handlers done at {time.time():.2f}", file=sys.stderr),
                         faulthandler.dump_traceback_later(2.0, repeat=True, exit=False)))
from accelbench.cli import main  # noqa: E402

sys.argv = ["accelbench", *sys.argv[1:]]
code = main()
print(f"exitwatch: main returned at {time.time():.2f}", file=sys.stderr)
sys.exit(code)
