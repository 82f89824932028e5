"""Group commit: the programs deciding now, and the fsync that waits for them, briefly.

The checkpoint's `sync` already lets one fsync cover every change appended before it. Under the
GIL that alone rarely groups a burst's prepares: each claim decides after the previous fsync has
ended. So the state's calls join the group when they start and leave it at their fsync (or
their end), and a prepare at its fsync first waits, at most GROUP_WAIT, for those deciding beside
it (docs/architecture.md, "Checkpoint format, group commit, what is fsynced").
"""

from __future__ import annotations

import threading

from dra.adapters.checkpoint import CheckpointStore

#: The most a save's fsync waits for the programs running beside it to reach their own, so that one
#: fsync covers the burst (docs/testing.md, issue 44): a few programs' decisions, well under a disk's fsync.
GROUP_WAIT = 0.005


class GroupCommit:
    """The programs deciding now, and the fsync that waits for them: one fsync for a burst of prepares.

    The claims of a burst arrive together, each on its own thread: the first at its fsync waits (at
    most GROUP_WAIT) for the others to decide and save, so that one fsync makes them all durable.
    With the GIL the others' decisions would otherwise fall between fsyncs, one each.
    """

    def __init__(self, checkpoint: CheckpointStore) -> None:
        """Group the fsyncs of this checkpoint."""
        self._checkpoint = checkpoint
        self._deciding = 0
        self._decided = threading.Condition()

    def join(self) -> Member:
        """Count a call's program among those deciding, until it syncs or ends."""
        with self._decided:
            self._deciding += 1
        return Member()

    def leave(self, member: Member | None) -> None:
        """The program is done deciding (at its fsync, or its end); once only."""
        if member is None or member.left:
            return
        member.left = True
        with self._decided:
            self._deciding -= 1
            if not self._deciding:
                self._decided.notify_all()

    def sync(self, member: Member | None, ticket: int) -> None:
        """Wait, briefly, for the programs deciding beside this one, then for the fsync of `ticket`."""
        self.leave(member)
        with self._decided:
            self._decided.wait_for(lambda: not self._deciding, GROUP_WAIT)
        self._checkpoint.sync(ticket)


class Member:
    """One call's place among the programs deciding."""

    def __init__(self) -> None:
        self.left = False
