from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ProtocolVersion(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    VERSION_ONE: _ClassVar[ProtocolVersion]
    VERSION_TWO: _ClassVar[ProtocolVersion]
    VERSION_THREE: _ClassVar[ProtocolVersion]

class OperationType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    READ_ENTRY: _ClassVar[OperationType]
    ADD_ENTRY: _ClassVar[OperationType]
    RANGE_READ_ENTRY: _ClassVar[OperationType]
    RANGE_ADD_ENTRY: _ClassVar[OperationType]
    AUTH: _ClassVar[OperationType]
    WRITE_LAC: _ClassVar[OperationType]
    READ_LAC: _ClassVar[OperationType]
    GET_BOOKIE_INFO: _ClassVar[OperationType]
    START_TLS: _ClassVar[OperationType]
    FORCE_LEDGER: _ClassVar[OperationType]

class StatusCode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    EOK: _ClassVar[StatusCode]
    ENOLEDGER: _ClassVar[StatusCode]
    ENOENTRY: _ClassVar[StatusCode]
    EBADREQ: _ClassVar[StatusCode]
    EIO: _ClassVar[StatusCode]
    EUA: _ClassVar[StatusCode]
    EBADVERSION: _ClassVar[StatusCode]
    EFENCED: _ClassVar[StatusCode]
    EREADONLY: _ClassVar[StatusCode]
    ETOOMANYREQUESTS: _ClassVar[StatusCode]
    EUNKNOWNLEDGERSTATE: _ClassVar[StatusCode]
VERSION_ONE: ProtocolVersion
VERSION_TWO: ProtocolVersion
VERSION_THREE: ProtocolVersion
READ_ENTRY: OperationType
ADD_ENTRY: OperationType
RANGE_READ_ENTRY: OperationType
RANGE_ADD_ENTRY: OperationType
AUTH: OperationType
WRITE_LAC: OperationType
READ_LAC: OperationType
GET_BOOKIE_INFO: OperationType
START_TLS: OperationType
FORCE_LEDGER: OperationType
EOK: StatusCode
ENOLEDGER: StatusCode
ENOENTRY: StatusCode
EBADREQ: StatusCode
EIO: StatusCode
EUA: StatusCode
EBADVERSION: StatusCode
EFENCED: StatusCode
EREADONLY: StatusCode
ETOOMANYREQUESTS: StatusCode
EUNKNOWNLEDGERSTATE: StatusCode

class BKPacketHeader(_message.Message):
    __slots__ = ("version", "operation", "txnId", "priority")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    TXNID_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    version: ProtocolVersion
    operation: OperationType
    txnId: int
    priority: int
    def __init__(self, version: _Optional[_Union[ProtocolVersion, str]] = ..., operation: _Optional[_Union[OperationType, str]] = ..., txnId: _Optional[int] = ..., priority: _Optional[int] = ...) -> None: ...

class Request(_message.Message):
    __slots__ = ("header", "readRequest", "addRequest", "readLacRequest")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    READREQUEST_FIELD_NUMBER: _ClassVar[int]
    ADDREQUEST_FIELD_NUMBER: _ClassVar[int]
    READLACREQUEST_FIELD_NUMBER: _ClassVar[int]
    header: BKPacketHeader
    readRequest: ReadRequest
    addRequest: AddRequest
    readLacRequest: ReadLacRequest
    def __init__(self, header: _Optional[_Union[BKPacketHeader, _Mapping]] = ..., readRequest: _Optional[_Union[ReadRequest, _Mapping]] = ..., addRequest: _Optional[_Union[AddRequest, _Mapping]] = ..., readLacRequest: _Optional[_Union[ReadLacRequest, _Mapping]] = ...) -> None: ...

class Response(_message.Message):
    __slots__ = ("header", "status", "readResponse", "addResponse", "readLacResponse")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    READRESPONSE_FIELD_NUMBER: _ClassVar[int]
    ADDRESPONSE_FIELD_NUMBER: _ClassVar[int]
    READLACRESPONSE_FIELD_NUMBER: _ClassVar[int]
    header: BKPacketHeader
    status: StatusCode
    readResponse: ReadResponse
    addResponse: AddResponse
    readLacResponse: ReadLacResponse
    def __init__(self, header: _Optional[_Union[BKPacketHeader, _Mapping]] = ..., status: _Optional[_Union[StatusCode, str]] = ..., readResponse: _Optional[_Union[ReadResponse, _Mapping]] = ..., addResponse: _Optional[_Union[AddResponse, _Mapping]] = ..., readLacResponse: _Optional[_Union[ReadLacResponse, _Mapping]] = ...) -> None: ...

class ReadRequest(_message.Message):
    __slots__ = ("flag", "ledgerId", "entryId", "masterKey", "previousLAC", "timeOut")
    class Flag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        FENCE_LEDGER: _ClassVar[ReadRequest.Flag]
        ENTRY_PIGGYBACK: _ClassVar[ReadRequest.Flag]
    FENCE_LEDGER: ReadRequest.Flag
    ENTRY_PIGGYBACK: ReadRequest.Flag
    FLAG_FIELD_NUMBER: _ClassVar[int]
    LEDGERID_FIELD_NUMBER: _ClassVar[int]
    ENTRYID_FIELD_NUMBER: _ClassVar[int]
    MASTERKEY_FIELD_NUMBER: _ClassVar[int]
    PREVIOUSLAC_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_FIELD_NUMBER: _ClassVar[int]
    flag: ReadRequest.Flag
    ledgerId: int
    entryId: int
    masterKey: bytes
    previousLAC: int
    timeOut: int
    def __init__(self, flag: _Optional[_Union[ReadRequest.Flag, str]] = ..., ledgerId: _Optional[int] = ..., entryId: _Optional[int] = ..., masterKey: _Optional[bytes] = ..., previousLAC: _Optional[int] = ..., timeOut: _Optional[int] = ...) -> None: ...

class ReadResponse(_message.Message):
    __slots__ = ("status", "ledgerId", "entryId", "body", "maxLAC", "lacUpdateTimestamp")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGERID_FIELD_NUMBER: _ClassVar[int]
    ENTRYID_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    MAXLAC_FIELD_NUMBER: _ClassVar[int]
    LACUPDATETIMESTAMP_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ledgerId: int
    entryId: int
    body: bytes
    maxLAC: int
    lacUpdateTimestamp: int
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., ledgerId: _Optional[int] = ..., entryId: _Optional[int] = ..., body: _Optional[bytes] = ..., maxLAC: _Optional[int] = ..., lacUpdateTimestamp: _Optional[int] = ...) -> None: ...

class AddRequest(_message.Message):
    __slots__ = ("flag", "ledgerId", "entryId", "masterKey", "body", "writeFlags")
    class Flag(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = ()
        RECOVERY_ADD: _ClassVar[AddRequest.Flag]
    RECOVERY_ADD: AddRequest.Flag
    FLAG_FIELD_NUMBER: _ClassVar[int]
    LEDGERID_FIELD_NUMBER: _ClassVar[int]
    ENTRYID_FIELD_NUMBER: _ClassVar[int]
    MASTERKEY_FIELD_NUMBER: _ClassVar[int]
    BODY_FIELD_NUMBER: _ClassVar[int]
    WRITEFLAGS_FIELD_NUMBER: _ClassVar[int]
    flag: AddRequest.Flag
    ledgerId: int
    entryId: int
    masterKey: bytes
    body: bytes
    writeFlags: int
    def __init__(self, flag: _Optional[_Union[AddRequest.Flag, str]] = ..., ledgerId: _Optional[int] = ..., entryId: _Optional[int] = ..., masterKey: _Optional[bytes] = ..., body: _Optional[bytes] = ..., writeFlags: _Optional[int] = ...) -> None: ...

class AddResponse(_message.Message):
    __slots__ = ("status", "ledgerId", "entryId")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGERID_FIELD_NUMBER: _ClassVar[int]
    ENTRYID_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ledgerId: int
    entryId: int
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., ledgerId: _Optional[int] = ..., entryId: _Optional[int] = ...) -> None: ...

class ReadLacRequest(_message.Message):
    __slots__ = ("ledgerId",)
    LEDGERID_FIELD_NUMBER: _ClassVar[int]
    ledgerId: int
    def __init__(self, ledgerId: _Optional[int] = ...) -> None: ...

class ReadLacResponse(_message.Message):
    __slots__ = ("status", "ledgerId", "lacBody", "lastEntryBody")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    LEDGERID_FIELD_NUMBER: _ClassVar[int]
    LACBODY_FIELD_NUMBER: _ClassVar[int]
    LASTENTRYBODY_FIELD_NUMBER: _ClassVar[int]
    status: StatusCode
    ledgerId: int
    lacBody: bytes
    lastEntryBody: bytes
    def __init__(self, status: _Optional[_Union[StatusCode, str]] = ..., ledgerId: _Optional[int] = ..., lacBody: _Optional[bytes] = ..., lastEntryBody: _Optional[bytes] = ...) -> None: ...
