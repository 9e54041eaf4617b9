"""What instances cost: prices with their date and source, selection by need and budget.

Modules: ``regions`` (which AWS regions exist, read from botocore's data file without loading
botocore), ``prices`` (a Price; the bundled table and the per-region cache of live answers),
``select`` (`types` filters, sorts and the --for rules), ``live`` (the AWS Price List Query API
and EC2's spot price history, through boto3: only this module talks to AWS), ``cost`` (what a
cluster's nodes cost so far). Of all this the CLI imports at start-up only the two closed lists
below, its options' choices (`select` applies them).
"""

SORTS = ("gpu-price", "price", "gpus")
PURPOSES = ("training", "inference")
