"""What the tests share beyond the fixtures of ``tests/conftest.py``: servers of their own (a
connection pooler, say) started and stopped by the tests that need them."""
