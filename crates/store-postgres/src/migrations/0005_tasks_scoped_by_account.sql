-- Version 5: workflow task ids are scoped by account. Another account's task
-- of the same id is a different task, so an enqueue never learns that an id
-- exists in another account.
ALTER TABLE tasks DROP CONSTRAINT tasks_pkey;
ALTER TABLE tasks ADD PRIMARY KEY (account, id);
