import sys

from chronowheel.cli import main

sys.exit(main())
