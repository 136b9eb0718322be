import sys

from switchboard_client.cli import main

sys.exit(main())
