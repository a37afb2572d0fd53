import sys

from koans.cli import main

sys.exit(main())
