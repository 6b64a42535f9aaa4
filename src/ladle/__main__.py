"""`python -m ladle ...` is `ladle ...`."""

import sys

from ladle.cli.main import main

sys.exit(main())
