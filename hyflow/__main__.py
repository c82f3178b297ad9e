"""`python -m hyflow <command>` is the same as `hyflow <command>`."""

import sys

from hyflow.cli import main

sys.exit(main())
