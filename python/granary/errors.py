"""granary.errors - the exceptions the store raises, one class per kind of failure.

Every exception is a `granary.Error` carrying `.code`, the store's error code (the same negative
numbers Mooncake uses, e.g. -704 for OBJECT_NOT_FOUND), and `.code_name`.
"""

from . import _granary


class Error(Exception):
    """Base class: any failure the store reports."""

    def __init__(self, code, message=""):
        self.code = int(code)
        self.code_name = _granary.error_name(self.code)
        super().__init__(message or self.code_name)

    def __str__(self):
        return f"{self.code_name} ({self.code}): {self.args[0]}"


class NotFound(Error, KeyError):
    """OBJECT_NOT_FOUND: no such key (or it was evicted). Also a KeyError."""

    def __str__(self):  # KeyError would print the repr of the message
        return Error.__str__(self)


class AlreadyExists(Error):
    """OBJECT_ALREADY_EXISTS."""


class NotReady(Error):
    """REPLICA_IS_NOT_READY: the object is still being written."""


class HasLease(Error):
    """OBJECT_HAS_LEASE: someone is reading it; remove with force=True to override."""


class BufferTooSmall(Error, ValueError):
    """BUFFER_OVERFLOW: the destination is smaller than the object (nothing was copied)."""


class NoSpace(Error):
    """NO_AVAILABLE_HANDLE: the store is full and nothing could be evicted."""


class InvalidArgument(Error, ValueError):
    """INVALID_PARAMS / INVALID_KEY: the call itself is wrong (sizes, addresses, pattern)."""


class Unavailable(Error):
    """RPC_FAIL / RPC_TIMEOUT / UNAVAILABLE_IN_CURRENT_STATUS: the master or a node is
    unreachable, or the store is closed."""


class Unauthenticated(Error, PermissionError):
    """UNAUTHENTICATED: the master requires the cluster's secret and this Store presented none,
    or a wrong one (auth_token_file= or $GRANARY_AUTH_TOKEN_FILE; docs/security.md)."""


class PermissionDenied(Error, PermissionError):
    """PERMISSION_DENIED: the master knows this Store's secret, but its role may not make the
    call (a tenant's token mounting a segment, a forced removal without the admin's secret;
    docs/security.md)."""


class QuotaExceeded(NoSpace):
    """QUOTA_EXCEEDED: the object would take this tenant past its quota (docs/security.md)."""


class TransferError(Error):
    """TRANSFER_FAIL / CHECKSUM_MISMATCH / WRITE_FAIL: the bytes could not be moved intact."""


class BatchError(Error):
    """A batch call in which some keys failed (other than by a miss). `.results` holds the
    per-key results in order, each failed one as its Error; `.errors` maps index -> Error."""

    def __init__(self, code, message, results):
        super().__init__(code, message)
        self.results = results
        self.errors = {i: r for i, r in enumerate(results) if isinstance(r, Error)}


_BY_CODE = {
    -704: NotFound,
    -705: AlreadyExists,
    -703: NotReady,
    -706: HasLease,
    -10: BufferTooSmall,
    -200: NoSpace,
    -400: InvalidArgument,
    -600: InvalidArgument,
    -900: Unavailable,
    -901: Unavailable,
    -1010: Unavailable,
    -1100: Unauthenticated,
    -1101: PermissionDenied,
    -1102: QuotaExceeded,
    -800: TransferError,
    -801: TransferError,
    -500: TransferError,
}


def error_for(code, message=""):
    """The exception instance for an error code (its class chosen by the code)."""
    return _BY_CODE.get(int(code), Error)(code, message)


_granary._set_error_factory(error_for)
