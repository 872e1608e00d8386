import sys

from toolservices.cli import main

sys.exit(main())
