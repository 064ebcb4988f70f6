import sys

from worker.train import main

sys.exit(main(sys.argv[1:]))
