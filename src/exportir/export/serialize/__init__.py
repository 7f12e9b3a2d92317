"""exportir.export.serialize: save / load an ExportedProgram (see docs/export.md, "Layout", and
docs/format/exported-program.md). The names a user needs are re-exported here."""

from exportir.export.serialize.archive import ArchiveLimitError, ArchiveLimits
from exportir.export.serialize.common import SerializationError
from exportir.export.serialize.save_load import load, save

__all__ = ["ArchiveLimitError", "ArchiveLimits", "SerializationError", "load", "save"]
