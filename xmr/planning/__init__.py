"""What the workflow asks while it plans: each rule's inputs, each job's resources, and the preflight
(``xmr doctor``)."""
