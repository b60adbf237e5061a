"""How much of the FM's gain reaches the VM: the transfer evaluation and the replay."""
