"""``python -m lit_asyncfl`` is ``lit-asyncfl``."""

from lit_asyncfl.cli import main

main()
