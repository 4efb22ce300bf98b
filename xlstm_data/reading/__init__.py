"""Step 3 of the flow: reading the documents of planned rows and assembling batches.

`planned_batches` is a data host's batches as a grain `MapDataset` indexed by
step; `row_assembly` turns one step's planned pieces into the arrays of an
`LLMBatch`, reading each document once.
"""
