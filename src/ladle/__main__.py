"""`python -m ladle ...` is `ladle ...`."""

import sys

from ladle.cli import main

sys.exit(main())
