"""The parts of ExecuTorch's ``program.fbs`` (the schema ExecuTorch 1.5.1 reads, file identifier
``ET12``) that exportir writes and reads: field slots of each table (a field's slot is its
declaration index, a union field taking two: its type, then its value), union tags, enums and
the extended file header. Standard library only.
"""

from __future__ import annotations

FILE_IDENTIFIER = b"ET12"
HEADER_MAGIC = b"eh00"
HEADER_LENGTH = 32  # magic, length (u32), program size, segment base offset, segment data size
HEADER_MIN_LENGTH = 24  # files written before the segment data size field
SEGMENT_ALIGNMENT = 128
TENSOR_ALIGNMENT = 16
PROGRAM_VERSION = 0  # Program.version that ExecuTorch's own serializer writes


class Program:
    version, execution_plan, constant_buffer, backend_delegate_data, segments = range(5)
    constant_segment, mutable_data_segments, named_data = range(5, 8)
    NUM = 8


class ExecutionPlan:
    name, container_meta_type, values, inputs, outputs, chains, operators, delegates = range(8)
    non_const_buffer_sizes, non_const_buffer_device = 8, 9
    NUM = 10


class ContainerMetadata:
    encoded_inp_str, encoded_out_str = range(2)
    NUM = 2


class Chain:
    inputs, outputs, instructions, stacktrace = range(4)
    NUM = 4


class Instruction:
    instr_args_type, instr_args = range(2)
    NUM = 2


class EValue:
    val_type, val = range(2)
    NUM = 2


class Tensor:
    scalar_type, storage_offset, sizes, dim_order, requires_grad, data_buffer_idx = range(6)
    allocation_info, layout, shape_dynamism, extra_tensor_info = range(6, 10)
    NUM = 10


class AllocationDetails:
    memory_id, memory_offset_low, memory_offset_high = range(3)
    NUM = 3


class ExtraTensorInfo:
    mutable_data_segments_idx, fully_qualified_name, location = range(3)
    NUM = 5


class Operator:
    name, overload = range(2)
    NUM = 2


class BackendDelegate:
    id, processed, compile_specs = range(3)
    NUM = 3


class DataSegment:
    offset, size = range(2)
    NUM = 2


class SubsegmentOffsets:
    segment_index, offsets = range(2)
    NUM = 2


# union KernelTypes: tag -> the table's name (0 is NONE)
KERNEL_TYPES = {
    1: "Null", 2: "Int", 3: "Bool", 4: "Double", 5: "Tensor", 6: "String", 7: "IntList",
    8: "DoubleList", 9: "BoolList", 10: "TensorList", 11: "OptionalTensorList",
}
KERNEL_TYPE_TAG = {name: tag for tag, name in KERNEL_TYPES.items()}

# union InstructionArguments
INSTRUCTION_TYPES = {1: "KernelCall", 2: "DelegateCall", 3: "MoveCall", 4: "JumpFalseCall",
                     5: "FreeCall"}
INSTRUCTION_TAG = {name: tag for tag, name in INSTRUCTION_TYPES.items()}

# enum TensorShapeDynamism
STATIC, DYNAMIC_BOUND, DYNAMIC_UNBOUND = 0, 1, 2

# enum TensorDataLocation (ExtraTensorInfo.location)
LOCATION_SEGMENT, LOCATION_EXTERNAL = 0, 1

# enum ScalarType values ExecuTorch defines (exportir's ScalarType numbers them the same way)
SCALAR_TYPES = frozenset(
    {0, 1, 2, 3, 4, 5, 6, 7, 11, 12, 13, 14, 15, 16, 17, 22, 23, 24, 25, 26, 27, 28, 29}
)
