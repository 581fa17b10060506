"""Who may do what: tokens and their roles, the credentials kept on disk, and approvals with who
made them."""
