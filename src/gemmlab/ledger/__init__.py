"""The experiment ledger (SQLite): every attempt, accepted or rejected with its reason.

from gemmlab.ledger import Ledger, Entry, decide
"""

from gemmlab.ledger.decide import decide, paired_speedup
from gemmlab.ledger.ready import check
from gemmlab.ledger.store import SCHEMA_VERSION, Entry, Ledger, LedgerError, default_path

__all__ = ["SCHEMA_VERSION", "Entry", "Ledger", "LedgerError", "check", "decide", "default_path", "paired_speedup"]
