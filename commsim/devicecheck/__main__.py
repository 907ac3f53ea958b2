import sys

from commsim.devicecheck.check import main

sys.exit(main())
