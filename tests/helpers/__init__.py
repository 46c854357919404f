"""What the test modules share besides conftest.py's fixtures (tests/conftest.py puts
tests/ on sys.path, so ``from helpers import shadow_run`` works in every room): no test
module imports another test module; what two of them share lives here."""
