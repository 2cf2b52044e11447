"""The block store: where the memory blocks of sessions at rest live, on disk or in an object store, not in Redis.

A session at rest is mostly its memory: every layer's keys and values for its last `mem_len` positions (8 MiB for
the bundled model, 114 MiB for `transfo-xl-wt103` in bfloat16). Redis keeps what a session *is* (metadata,
versions as headers listing block ids, leases, block reference counts: store/); the bytes of each block are an
object here, written once and shared by every version, fork and session that lists it, as in Redis before.

    codec.py       a block's bytes on disk: a short header with their length and checksum (a partial or damaged
                   write is noticed, never read as a memory)
    backend.py     what a place to put objects offers (put, get, delete, list)
    directory.py   a directory: a local disk, or a filesystem every replica mounts (NFS, EFS, Filestore, CephFS)
    objects.py     an object store through obstore: s3://, gs://, az:// (and file://, memory:// for tests)
    local_tier.py  a replica's local disk in front of a shared store: recently used blocks, under a byte budget
    store.py       the block store the session layer uses: blocks written in parallel off the event loop before
                   any version names them, read back checked, and the store's identity
    sweeper.py     collects blocks no version names any more (deleted and expired sessions, crashed writers)
    migration.py   moves the blocks an older server kept in Redis into the store
"""
