package storage_test

const crashChildEnv = "SYNCGATE_STORAGE_CRASH_CHILD"
