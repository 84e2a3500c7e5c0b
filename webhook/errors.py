"""The project's errors, and what each becomes at the edge.

    CardquotaError
    ├── BadReview      the AdmissionReview cannot be answered     → HTTP 400 / CLI exit 2
    ├── NotReady       the cache has not synced yet               → HTTP 503 / kubectl-cardquota exit 3
    └── ConfigError    bad settings or certificates               → fail at start / CLI exit 2
        └── SnapshotError  a snapshot file or document is malformed (names file and document)

A denial is not an error: it is a ``Denied`` value from the core.
"""


class CardquotaError(Exception):
    """Base of every error this project raises on purpose."""


class BadReview(CardquotaError):
    """The input is not an AdmissionReview we can answer."""


class NotReady(CardquotaError):
    """The cache has not synced every kind yet."""


class ConfigError(CardquotaError):
    """Settings, certificates or a cluster snapshot are unusable."""


class SnapshotError(ConfigError):
    """A snapshot file or document is malformed."""
