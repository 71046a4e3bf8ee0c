"""The `DeadLetterSink` contract: letters land in `{prefix}:dlq` with the original bytes."""

from __future__ import annotations

from eco_router.application.ports import DeadLetterSink
from eco_router.domain.rejection import RejectReason
from tests.contracts.factories import RAW_FIELDS, ContractFamilies, Fields, entry_id


class DeadLetterSinkContract(ContractFamilies):
    """Every `DeadLetterSink` adapter, read back from the backend it writes to.

    Subclasses wire a backend and implement the hooks below.
    """

    async def make_sink(self) -> DeadLetterSink:
        raise NotImplementedError

    async def dead_letters(self, stream: str) -> list[Fields]:
        """The fields of every entry of `stream`, oldest first, exactly as stored."""
        raise NotImplementedError

    async def test_a_letter_lands_in_its_familys_dead_letter_stream_with_its_origin(
        self,
    ) -> None:
        sink = await self.make_sink()

        await sink.send([self.letter()])

        [stored] = await self.dead_letters(self.scan.dead_letter_stream)
        assert stored[b"stream"] == self.scan_1.encode()
        assert stored[b"id"] == entry_id(7).encode()
        assert stored[b"reason"] == b"seq_not_integer"
        assert stored[b"detail"] == b"seq 'not-a-number' is not an integer"
        assert stored[b"deliveries"] == b"3"
        assert stored[b"dead_at_ms"].isdigit()

    async def test_the_original_fields_are_kept_byte_for_byte(self) -> None:
        sink = await self.make_sink()

        await sink.send([self.letter()])

        [stored] = await self.dead_letters(self.scan.dead_letter_stream)
        originals = {
            name.removeprefix(b"field:"): value
            for name, value in stored.items()
            if name.startswith(b"field:")
        }
        assert originals == RAW_FIELDS

    async def test_letters_keep_their_order_and_go_to_their_own_family(self) -> None:
        sink = await self.make_sink()
        first = self.letter(entry_id=entry_id(1))
        chat = self.letter(
            family=self.chat,
            stream=self.chat_0,
            entry_id=entry_id(2),
            reason=RejectReason.MAX_DELIVERIES,
            detail="delivered 11 times (max 10)",
        )
        second = self.letter(entry_id=entry_id(3), reason=RejectReason.NOT_UTF8, detail="ü")

        await sink.send([first, chat, second])

        scan_letters = await self.dead_letters(self.scan.dead_letter_stream)
        chat_letters = await self.dead_letters(self.chat.dead_letter_stream)
        assert [(f[b"id"], f[b"reason"]) for f in scan_letters] == [
            (entry_id(1).encode(), b"seq_not_integer"),
            (entry_id(3).encode(), b"not_utf8"),
        ]
        assert scan_letters[1][b"detail"] == "ü".encode()
        assert [(f[b"stream"], f[b"id"], f[b"reason"]) for f in chat_letters] == [
            (self.chat_0.encode(), entry_id(2).encode(), b"max_deliveries")
        ]

    async def test_sending_no_letters_writes_nothing(self) -> None:
        sink = await self.make_sink()

        await sink.send([])

        assert await self.dead_letters(self.scan.dead_letter_stream) == []

    async def test_an_entry_is_dead_lettered_once_however_often_its_letter_comes(
        self,
    ) -> None:
        # A router that died before its ack, or paused past its lease, sends it again.
        sink = await self.make_sink()

        await sink.send([self.letter(), self.letter()])
        await sink.send([self.letter(delivery_count=4, detail="sent again")])
        await sink.send([self.letter(stream=self.scan_0)])  # the same id on another shard

        stored = await self.dead_letters(self.scan.dead_letter_stream)
        assert [(f[b"stream"], f[b"id"], f[b"deliveries"]) for f in stored] == [
            (self.scan_1.encode(), entry_id(7).encode(), b"3"),
            (self.scan_0.encode(), entry_id(7).encode(), b"3"),
        ]
