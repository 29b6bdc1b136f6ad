"""``python -m attnverify.empirical …``: the model check without the main CLI."""

import sys

from attnverify.empirical.cli import main

sys.exit(main())
