"""``cardquota serve`` with every decision replaced by a constant ``Allowed``: the server's own cost.

Run by make bench next to the real server and the floor, so the table shows how the time splits
between the framework (TLS, HTTP, parsing, metrics, response) and the decision itself.
"""

import sys

from webhook.core.model.verdicts import Allowed
from webhook.serve import review
from webhook.tools import cli

ALLOWED = Allowed("constant (benchmark)")


def constant(*_: object) -> Allowed:
    return ALLOWED


if __name__ == "__main__":
    review.decide_request = constant  # type: ignore[assignment]
    sys.exit(cli.main(sys.argv[1:]))
