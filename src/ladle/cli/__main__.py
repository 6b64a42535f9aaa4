"""`python -m ladle.cli ...`, the same as the `ladle` command."""

import sys

from ladle.cli.main import main

sys.exit(main())
