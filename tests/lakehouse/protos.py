"""A protobuf schema for the PROTOBUF_NATIVE tests, built as a FileDescriptorSet (no protoc):
``shop/order.proto`` and its import, and the message class a producer would generate."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

__all__ = ["order_class", "order_file_set"]


def order_file_set() -> descriptor_pb2.FileDescriptorSet:
    """shop/order.proto (proto3): Order {int64 id; int32 qty; Address address; repeated string
    tags; google.protobuf.Timestamp at; State state; map<string, int32> counts; Order parent},
    its imports listed after it."""
    fd = descriptor_pb2.FieldDescriptorProto
    f = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop",
                                           syntax="proto3",
                                           dependency=["google/protobuf/timestamp.proto"])
    addr = f.message_type.add(name="Address")
    addr.field.add(name="city", number=1, type=fd.TYPE_STRING, label=fd.LABEL_OPTIONAL)
    state = f.enum_type.add(name="State")
    state.value.add(name="NEW", number=0)
    state.value.add(name="PAID", number=1)
    m = f.message_type.add(name="Order")
    counts = m.nested_type.add(name="CountsEntry")
    counts.options.map_entry = True
    counts.field.add(name="key", number=1, type=fd.TYPE_STRING, label=fd.LABEL_OPTIONAL)
    counts.field.add(name="value", number=2, type=fd.TYPE_INT32, label=fd.LABEL_OPTIONAL)
    for no, name, typ, label, type_name in (
            (1, "id", fd.TYPE_INT64, fd.LABEL_OPTIONAL, ""),
            (2, "qty", fd.TYPE_INT32, fd.LABEL_OPTIONAL, ""),
            (3, "address", fd.TYPE_MESSAGE, fd.LABEL_OPTIONAL, ".shop.Address"),
            (4, "tags", fd.TYPE_STRING, fd.LABEL_REPEATED, ""),
            (5, "at", fd.TYPE_MESSAGE, fd.LABEL_OPTIONAL, ".google.protobuf.Timestamp"),
            (6, "state", fd.TYPE_ENUM, fd.LABEL_OPTIONAL, ".shop.State"),
            (7, "counts", fd.TYPE_MESSAGE, fd.LABEL_REPEATED, ".shop.Order.CountsEntry"),
            (8, "parent", fd.TYPE_MESSAGE, fd.LABEL_OPTIONAL, ".shop.Order")):
        field = m.field.add(name=name, number=no, type=typ, label=label)
        if type_name:
            field.type_name = type_name
    ts = descriptor_pb2.FileDescriptorProto()
    timestamp_pb2.DESCRIPTOR.CopyToProto(ts)
    return descriptor_pb2.FileDescriptorSet(file=[f, ts])


def order_class() -> Any:
    """``shop.Order``'s message class, from a pool of its own (the producer's side)."""
    fds = order_file_set()
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fds.file[1])
    pool.Add(fds.file[0])
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))
