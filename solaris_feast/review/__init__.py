"""What a reviewer reads: the store's status and the lineage from sources to the VM's card."""
