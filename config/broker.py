"""
The embedded default's message broker: kombu's file-system transport, with messages that appear
whole. Kombu's own ``_put`` creates the message file and then writes it, and its ``_get`` takes
any file of the queue at once: a worker polling at that moment read an empty file, failed to
decode it, lost the message and stopped ("Unrecoverable error: JSONDecodeError"), and the run
command stopped with it. Here a message is written under a name the consumer ignores and renamed
into place (an atomic rename in the same folder).
"""

from __future__ import annotations

import os
import uuid
from time import monotonic

from kombu.exceptions import ChannelError
from kombu.transport import filesystem
from kombu.utils.encoding import str_to_bytes
from kombu.utils.json import dumps

PARTIAL = ".part"  # a message being written: "<time>_<uuid>.<queue>.msg.part", not "<queue>.msg"


class AtomicChannel(filesystem.Channel):
    def _put(self, queue, payload, **kwargs):
        """Put ``payload`` onto ``queue``: written whole, then renamed to the name ``_get`` looks for."""
        name = f"{int(round(monotonic() * 1000))}_{uuid.uuid4()}.{queue}.msg"
        final = os.path.join(self.data_folder_out, name)
        try:
            with open(final + PARTIAL, "wb") as handle:
                handle.write(str_to_bytes(dumps(payload)))
            os.replace(final + PARTIAL, final)
        except OSError as exc:
            raise ChannelError(f"Cannot add file {final!r} to directory") from exc


def use_atomic_messages() -> None:
    """Every file-system connection of this process uses AtomicChannel (set up with the Celery app)."""
    filesystem.Transport.Channel = AtomicChannel
