import sys

from captioner.app.cli import main

sys.exit(main())
