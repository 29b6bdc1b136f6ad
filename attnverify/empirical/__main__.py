"""``python -m attnverify.empirical …``: the model check without the main CLI.

Ctrl-C is exit 130 with one line, also while the modules are still importing.
"""

import sys

try:
    from attnverify.empirical.cli import main

    code = main()
except KeyboardInterrupt:
    print("attnverify empirical: interrupted", file=sys.stderr)
    code = 130
sys.exit(code)
