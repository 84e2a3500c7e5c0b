import sys

from webhook.tools.cli import main

sys.exit(main())
