import os
import sys

# The reference module sits beside the tests.
sys.path.insert(0, os.path.dirname(__file__))
