import sys

from fastbus.cli import main

sys.exit(main())
