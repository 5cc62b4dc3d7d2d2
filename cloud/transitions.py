"""
Legal state moves of the inventory, one table per model (nodes, GPUs), made only through
``core.transitions.compare_and_set``; new states and moves go into these tables, never into a
parallel one.
"""


from cloud.choices import GPUState, NodeState

N = NodeState
NODE_TRANSITIONS: dict[str, frozenset[str]] = {
    N.ENROLLED: frozenset({N.VALIDATING, N.MAINTENANCE}),
    N.VALIDATING: frozenset(
        {N.AVAILABLE, N.IN_SERVICE, N.FAULTY, N.QUARANTINED, N.REFERENCE_UNAVAILABLE, N.MAINTENANCE}
    ),
    N.AVAILABLE: frozenset(
        {N.ALLOCATED, N.IN_SERVICE, N.VALIDATING, N.SUSPECT, N.QUARANTINED, N.REFERENCE_UNAVAILABLE, N.FAULTY,
         N.MAINTENANCE}
    ),
    # Attestation before a hand-over can find firmware nobody registered reference values for.
    N.ALLOCATED: frozenset({N.RELEASING, N.SUSPECT, N.FAULTY, N.QUARANTINED, N.REFERENCE_UNAVAILABLE}),
    N.IN_SERVICE: frozenset({N.AVAILABLE, N.SUSPECT, N.FAULTY, N.QUARANTINED, N.REFERENCE_UNAVAILABLE,
                             N.MAINTENANCE}),
    N.RELEASING: frozenset({N.AVAILABLE, N.FAULTY, N.QUARANTINED, N.REFERENCE_UNAVAILABLE}),
    N.SUSPECT: frozenset({N.AVAILABLE, N.ALLOCATED, N.IN_SERVICE, N.FAULTY, N.MAINTENANCE}),
    N.QUARANTINED: frozenset({N.VALIDATING, N.REPAIR, N.MAINTENANCE}),
    N.REFERENCE_UNAVAILABLE: frozenset({N.VALIDATING, N.QUARANTINED, N.MAINTENANCE}),
    N.FAULTY: frozenset({N.REPAIR, N.MAINTENANCE}),
    N.REPAIR: frozenset({N.VALIDATING}),
    N.MAINTENANCE: frozenset({N.VALIDATING, N.AVAILABLE, N.IN_SERVICE}),
}
# A node held for maintenance (or suspected) goes back to one of these directly only if it came
# from it; from any other state it goes through validation first (services decide, see
# cloud.services.node_maintenance_end).
NODE_RETURNABLE = frozenset({N.AVAILABLE, N.IN_SERVICE})

G = GPUState
GPU_TRANSITIONS: dict[str, frozenset[str]] = {
    G.AVAILABLE: frozenset({G.ALLOCATED, G.QUARANTINED}),
    G.ALLOCATED: frozenset({G.SCRUBBING, G.QUARANTINED}),
    G.SCRUBBING: frozenset({G.AVAILABLE, G.QUARANTINED}),
    G.QUARANTINED: frozenset({G.AVAILABLE}),
}
