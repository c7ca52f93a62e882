"""Assets of the lifecycle, one module per stage; thin glue around ml/ and the resources."""
