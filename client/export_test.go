package client

// TakeOverWaitForTest is takeOverWait, for the external tests' bounds.
const TakeOverWaitForTest = takeOverWait
