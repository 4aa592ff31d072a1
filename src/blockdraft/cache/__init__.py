"""Cache bookkeeping for the batch engine: capacity planning, block tables, paged pools."""
