import sys

from inferwire.cli.main import main

sys.exit(main())
