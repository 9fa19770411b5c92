"""What people look at: the terminal live view (`vigil top`) and the HTML job report
(`vigil report`)."""
