# The README's two commands. Their logic is in scripts/dev.py (Python standard library only), so
# `python3 scripts/dev.py demo|test` does the same where make is absent.
PYTHON ?= python3

.PHONY: demo test docs

# Evaluate the shipped tiny checkpoint on the built-in env: success table, videos in runs/demo.
demo:
	$(PYTHON) scripts/dev.py demo

# ruff and the whole test suite, slow tests and LIBERO included (what CI runs); pytest arguments:
# make test ARGS="-k x" (a plain pytest is the fast suite; make test ARGS="-m slow" the slow tests)
test:
	$(PYTHON) scripts/dev.py test $(ARGS)

# The documentation site into build/site, strictly: a broken link or API reference fails it.
docs:
	$(PYTHON) scripts/dev.py docs
