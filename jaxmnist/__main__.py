import sys

from jaxmnist.cli import main

sys.exit(main())
