import sys

from boardwalk_cli.main import main

sys.exit(main())
