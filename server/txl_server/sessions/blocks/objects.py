"""An object store as a block store, through obstore (the Rust `object_store` crate that Apache Arrow, DataFusion
and others use): `s3://bucket/prefix` (and S3-compatible stores), `gs://bucket/prefix`, `az://container/prefix`,
with their standard credentials from the environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`), and `file:///path` or
`memory://` for tests. One library, one asynchronous API for every cloud, without a client per vendor: why
obstore rather than fsspec (which needs s3fs, gcsfs and adlfs, each with its own event loop and semantics).

An object store writes an object whole or not at all, and a write returns once it is durable there."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import obstore
from obstore.exceptions import AlreadyExistsError, BaseError, NotFoundError
from obstore.store import from_url

from .backend import Listed, StoreUnreachable

OBJECT_STORE_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "azure", "file", "memory", "http", "https")


class ObjectBackend:
    def __init__(self, url: str, **options: Any) -> None:
        self.store = from_url(url, **options)
        self.where = url

    async def put(self, key: str, data: bytes) -> None:
        try:
            await obstore.put_async(self.store, key, data)
        except (BaseError, OSError) as exc:
            raise self._unreachable("write to", exc) from exc

    async def put_new(self, key: str, data: bytes) -> bool:
        try:
            await obstore.put_async(self.store, key, data, mode="create")
        except AlreadyExistsError:
            return False
        except (BaseError, OSError) as exc:
            raise self._unreachable("write to", exc) from exc
        return True

    async def get(self, key: str) -> bytes | None:
        try:
            result = await obstore.get_async(self.store, key)
            return bytes(await result.bytes_async())
        except (FileNotFoundError, NotFoundError):
            return None
        except (BaseError, OSError) as exc:
            raise self._unreachable("read from", exc) from exc

    async def delete(self, keys: list[str]) -> None:
        for key in keys:  # one at a time: a local store fails a batch on its first missing object
            try:
                await obstore.delete_async(self.store, key)
            except (FileNotFoundError, NotFoundError):
                pass
            except (BaseError, OSError) as exc:
                raise self._unreachable("remove an object in", exc) from exc

    async def listing(self, prefix: str) -> AsyncIterator[Listed]:
        try:
            async for chunk in obstore.list(self.store, prefix=prefix):
                for meta in chunk:
                    yield Listed(str(meta["path"]), meta["last_modified"].timestamp(), int(meta["size"]))
        except (FileNotFoundError, NotFoundError):
            return
        except (BaseError, OSError) as exc:
            raise self._unreachable("list", exc) from exc

    def _unreachable(self, what: str, exc: BaseException) -> StoreUnreachable:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return StoreUnreachable(f"cannot {what} {self.where}: {first}")


def is_object_store_url(value: str) -> bool:
    scheme, sep, _ = value.partition("://")
    return bool(sep) and scheme.lower() in OBJECT_STORE_SCHEMES
