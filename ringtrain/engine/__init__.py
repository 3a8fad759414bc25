"""The background engine: queue, negotiation, fusion, execution, timeline and stall checks."""
