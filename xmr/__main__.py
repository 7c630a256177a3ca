import sys

from xmr.cli import main

sys.exit(main())
