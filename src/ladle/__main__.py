"""`python -m ladle` runs the `ladle` command."""

import sys

from ladle.cli import main

sys.exit(main())
