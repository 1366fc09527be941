"""The interception core: protocol-neutral views of what flows through the bridge in, decisions
out. Front-ends translate their wire to views and decisions back to their bytes."""
