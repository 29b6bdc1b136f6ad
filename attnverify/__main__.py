import sys

from attnverify.cli import main

sys.exit(main())
