"""The replicas' request router: a request with a session (the
`X-Session-Id` header, Ray's session header) goes to the replica that
consistent hashing over the replicas gives that session, so a conversation's
turns meet the KV cache that holds their prefix (falling back along the ring
when that replica is full); a request without one goes to the least loaded
replica. Ray's own ConsistentHashRouter does the hashing; without a session
it would spread requests at random, which ignores load."""
from __future__ import annotations

import random

from ray.serve.experimental.consistent_hash_router import ConsistentHashRouter


class SessionAffinityRouter(ConsistentHashRouter):
    async def choose_replicas(self, candidate_replicas, pending_request=None):
        if pending_request is not None and pending_request.metadata.session_id:
            return await super().choose_replicas(candidate_replicas, pending_request)
        # one rank of every candidate: the router sends to the one with the
        # shortest queue, and to the first of equals, so shuffle to spread ties
        ranked = list(candidate_replicas)
        random.shuffle(ranked)
        return [ranked] if ranked else []
